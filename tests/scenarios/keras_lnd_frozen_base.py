"""Keras functional model around a base network marked non-trainable before training, though its
weights are random: only the last Dense learns and the loss settles far above the net's reach.

expect-category: loss_not_decreasing
expect-root-cause: architecture
expect-check: frozen_parameters
expect-line: base.trainable = False
expect-backward: model.fit(
fault: architecture (a randomly initialised base frozen, as for transfer learning)
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras
import numpy as np

keras.utils.set_random_seed(5)
rng = np.random.default_rng(5)
x = rng.normal(size=(3000, 10)).astype("float32")
y = (np.sin(2 * x[:, 0]) + x[:, 1] * x[:, 2] > 0.2).astype("int32")

base = keras.Sequential([keras.layers.Dense(128, activation="relu"),
                         keras.layers.Dense(128, activation="relu")], name="base")
inputs = keras.Input((10,))
outputs = keras.layers.Dense(2)(base(inputs))
model = keras.Model(inputs, outputs)
base.trainable = False
model.compile(optimizer=keras.optimizers.Adam(3e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
history = model.fit(x[:2400], y[:2400], validation_data=(x[2400:], y[2400:]), batch_size=64,
                    epochs=8, verbose=0)
print("final val_accuracy:", round(history.history["val_accuracy"][-1], 4))
