"""Keras custom loop: SGD with a learning rate far too high diverges to inf/NaN (GradientTape).

expect-category: gradient_instability
expect-root-cause: hyperparameter
expect-check: lr_range|gradient_flow
expect-line: keras.optimizers.SGD
expect-backward: tape.gradient(
fault: hyperparameter (learning_rate=3.0 for plain SGD on a regression)
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
import keras

keras.utils.set_random_seed(5)
rng = np.random.default_rng(5)
X = rng.standard_normal((1024, 6)).astype("float32")
y = X @ rng.standard_normal((6, 1)).astype("float32")
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1)])
optimizer = keras.optimizers.SGD(learning_rate=3.0)
loss_fn = keras.losses.MeanSquaredError()
for step in range(200):
    idx = rng.integers(0, len(X), 64)
    with tf.GradientTape() as tape:
        loss = loss_fn(y[idx], model(X[idx], training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    if step % 20 == 0:
        print(f"step {step} loss={float(loss):.4g}")
