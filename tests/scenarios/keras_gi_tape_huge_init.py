"""Keras custom loop: a tf.function train step over shuffled NumPy minibatches; every Dense layer
is initialised with a spread far beyond its fan-in's (stddev 8), so the first losses are huge.

expect-category: gradient_instability
expect-root-cause: architecture
expect-check: initialization
expect-line: RandomNormal(stddev=8.0)
expect-backward: loss = step(
fault: architecture (RandomNormal(stddev=8.0) kernels in every layer)
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import keras
import tensorflow as tf

keras.utils.set_random_seed(1)
rng = np.random.default_rng(1)
features = rng.standard_normal((3000, 12)).astype("float32")
labels = (features[:, :4] @ np.array([1.0, -1.0, 0.5, 2.0]) > 0).astype("int32")
big = keras.initializers.RandomNormal(stddev=8.0)
net = keras.Sequential([
    keras.Input((12,)),
    keras.layers.Dense(48, activation="relu", kernel_initializer=big),
    keras.layers.Dense(48, activation="relu", kernel_initializer=big),
    keras.layers.Dense(2, kernel_initializer=big),
])
criterion = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
opt = keras.optimizers.Adam(learning_rate=1e-3)


@tf.function
def step(xb, yb):
    with tf.GradientTape() as tape:
        loss = criterion(yb, net(xb, training=True))
    grads = tape.gradient(loss, net.trainable_variables)
    opt.apply_gradients(zip(grads, net.trainable_variables))
    return loss


for epoch in range(6):
    order = rng.permutation(2400)
    for start in range(0, 2400, 50):
        idx = order[start:start + 50]
        loss = step(features[idx], labels[idx])
    logits = net(features[2400:], training=False)
    acc = float(np.mean(np.argmax(logits, axis=1) == labels[2400:]))
    print(f"epoch {epoch}: loss {float(loss):.3f} held-out acc {acc:.3f}")
