"""Slow: Keras fit with batch_size=1 on a small classifier; per-step overhead dominates.

expect-category: performance_issue
expect-root-cause: hyperparameter
expect-check: small_batches
expect-line: .fit(
expect-backward: .fit(
expect-revealed: small_batches
fault: hyperparameter (batch_size=1)
"""
import numpy as np
from keras import Sequential, layers

rng = np.random.default_rng(4)
features = rng.normal(size=(1500, 8)).astype("float32")
labels = (features[:, 0] - features[:, 3] > 0).astype("float32")

clf = Sequential([layers.Input((8,)), layers.Dense(16, activation="relu"),
                  layers.Dense(1, activation="sigmoid")])
clf.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
clf.fit(features, labels, batch_size=1, epochs=2, verbose=2)
