"""Keras: a small MLP learns a separable problem with Adam (model.fit with validation).

expect-category: healthy
expect-backward: model.fit(
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import keras

keras.utils.set_random_seed(1)
rng = np.random.default_rng(1)
X = rng.standard_normal((2048, 10)).astype("float32")
y = (X[:, 0] - X[:, 1] > 0).astype("int64")
model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(2)])
model.compile(optimizer=keras.optimizers.Adam(3e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
model.fit(X, y, batch_size=64, epochs=5, validation_split=0.2, verbose=2)
