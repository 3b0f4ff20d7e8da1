"""Keras: loss falls, accuracy never leaves the majority rate: the model predicts "negative" always.

expect-category: convergence_to_wrong_solution
expect-root-cause: data
expect-check: class_imbalance
expect-line: model.fit(X, y
expect-backward: model.fit(
fault: data (95/5 class imbalance, no class weights)
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import keras

keras.utils.set_random_seed(12)
rng = np.random.default_rng(12)
n = 4000
y = (rng.random(n) < 0.05).astype("float32")
X = (rng.standard_normal((n, 20)) + 0.15 * y[:, None]).astype("float32")
Xv, yv = X[3000:], y[3000:]
X, y = X[:3000], y[:3000]
model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.05),
              loss=keras.losses.BinaryCrossentropy(from_logits=True),
              metrics=[keras.metrics.BinaryAccuracy(name="accuracy", threshold=0.0)])
model.fit(X, y, batch_size=100, epochs=5, validation_data=(Xv, yv), verbose=0)
