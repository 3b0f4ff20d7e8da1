"""Keras: the loss only falls to the label prior's and accuracy never leaves the majority rate.
Features and labels come from two tables; the features were re-ordered by customer id, the labels
were not, so row i's label belongs to another customer.

expect-category: convergence_to_wrong_solution
expect-root-cause: data
expect-check: label_alignment
expect-line: usage = usage[np.argsort(customer_id)]
expect-backward: model.fit(
fault: data (X sorted by id, y left in file order)
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import keras

keras.utils.set_random_seed(5)
rng = np.random.default_rng(5)
n = 2400
customer_id = rng.permutation(n)
usage = rng.normal(size=(n, 12)).astype("float32")
churn = (usage[:, 0] - usage[:, 3] + 0.5 * usage[:, 7] > 0.2).astype("int64")
usage = usage[np.argsort(customer_id)]  # the feature table, sorted by id; churn is not
model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(48, activation="relu"),
                          keras.layers.Dense(2)])
model.compile(optimizer=keras.optimizers.RMSprop(learning_rate=1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
model.fit(usage, churn, batch_size=64, epochs=4, validation_split=0.2, verbose=2)
