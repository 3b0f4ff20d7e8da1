"""Keras: a wide MLP memorises 64 noisy samples; validation loss turns up (model.fit).

expect-category: overfitting
expect-root-cause: data
expect-check: data_volume
expect-line: model = keras.Sequential
expect-backward: model.fit(
fault: data (too little data for the capacity), no regularisation
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import keras

keras.utils.set_random_seed(3)
rng = np.random.default_rng(3)


def make(n):
    X = rng.standard_normal((n, 30)).astype("float32")
    y = ((X[:, 0] + 0.8 * rng.standard_normal(n)) > 0).astype("int64")
    return X, y


X, y = make(64)
Xv, yv = make(512)
model = keras.Sequential([keras.Input((30,)), keras.layers.Dense(512, activation="relu"),
                          keras.layers.Dense(512, activation="relu"), keras.layers.Dense(2)])
model.compile(optimizer=keras.optimizers.Adam(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
model.fit(X, y, batch_size=4, epochs=12, validation_data=(Xv, yv), verbose=0)
