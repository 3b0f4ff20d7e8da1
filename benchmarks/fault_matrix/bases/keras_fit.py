"""Keras Sequential classifier on tabular data (standardised with NumPy), model.fit with
validation_split; the history holds the validation metrics."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
from keras import layers

rng = np.random.default_rng(21)
n = 2400
raw = np.column_stack([rng.normal(50, 10, n), rng.normal(0.5, 0.2, n), rng.normal(900, 150, n),
                       rng.normal(0, 1, n), rng.normal(10, 3, n)]).astype("float32")
score = (raw[:, 0] - 50) / 10 + 2 * (raw[:, 1] - 0.5) / 0.2 - (raw[:, 2] - 900) / 150
y = np.digitize(score, [-1.0, 1.0]).astype("int64")
X = (raw - raw.mean(axis=0)) / raw.std(axis=0)

model = keras.Sequential([
    keras.Input(shape=(5,)),
    layers.Dense(32, activation="relu"),
    layers.Dropout(0.1),
    layers.Dense(32, activation="relu"),
    layers.Dense(3, activation="softmax"),
])
model.compile(optimizer=keras.optimizers.Adam(learning_rate=3e-3),
              loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(X, y, epochs=6, batch_size=32, validation_split=0.2, verbose=2)
print("final val_accuracy:", round(history.history["val_accuracy"][-1], 4))
