"""categorical_crossentropy over a single sigmoid unit: the loss reads 0 at every step.

Keras normalises the predictions over the last axis; over one unit that is always 1.0, so
the loss is exactly 0 whatever the model outputs, while training accuracy stays at the class
prior. The loss curve looks perfect; the metric shows the model learned nothing. The cause is
the loss chosen for a one-unit output, measured as a loss that never moved; it is fixed where
the loss is chosen, so the cause is the training setup's (training_loop), not the model's.

expect-category: convergence_to_wrong_solution
expect-root-cause: training_loop
expect-check: loss_output_mismatch
expect-line: categorical_crossentropy
expect-backward: fit(
"""
import numpy as np
from tensorflow import keras

np.random.seed(5)
n = 1200
X = np.random.randn(n, 6).astype("float32")
w = np.array([1.5, -2.0, 0.7, 0.0, 1.1, -0.4])
y = (X @ w + 0.3 * np.random.randn(n) > 0).astype("float32")

clf = keras.models.Sequential()
clf.add(keras.layers.Dense(16, input_shape=(6,), activation="relu"))
clf.add(keras.layers.Dense(1, activation="sigmoid"))
clf.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
clf.fit(X[:1000], y[:1000], epochs=6, batch_size=25, validation_data=(X[1000:], y[1000:]),
        verbose=2)
