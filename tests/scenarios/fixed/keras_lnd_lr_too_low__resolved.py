"""Keras: loss stuck, SGD with a learning rate far too small for the problem (model.fit).

expect-category: loss_not_decreasing
expect-root-cause: hyperparameter
expect-check: lr_range
expect-line: keras.optimizers.SGD
expect-backward: model.fit(
fault: hyperparameter (learning_rate=1e-5 for plain SGD)
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import keras

keras.utils.set_random_seed(0)
X = np.random.randn(2048, 20).astype("float32")
y = (X[:, :5].sum(axis=1) > 0).astype("int64")
model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(64, activation="tanh"),
                          keras.layers.Dense(2)])
model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(X, y, batch_size=64, epochs=4, verbose=2)
