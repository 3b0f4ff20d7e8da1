"""Slow: a tf.GradientTape loop whose tf.function step is given the epoch's Python float decay.

expect-category: performance_issue
expect-root-cause: training_loop
expect-check: retracing
expect-line: fit_batch(
expect-backward: fit_batch(
fault: training_loop (a new Python float every step retraces the compiled step)
"""
import numpy as np
import tensorflow as tf
import keras

rng = np.random.default_rng(11)
images = rng.normal(size=(2048, 12)).astype("float32")
digits = (images[:, :3].sum(axis=1) > 0).astype("int32") + 2 * (images[:, 5] > 0.5)

net = keras.Sequential([keras.Input((12,)), keras.layers.Dense(48, activation="tanh"),
                        keras.layers.Dense(4)])
opt = keras.optimizers.SGD(0.05)
xent = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@tf.function
def fit_batch(xb, yb, scale):
    with tf.GradientTape() as tape:
        loss = scale * xent(yb, net(xb, training=True))
    opt.apply_gradients(zip(tape.gradient(loss, net.trainable_variables), net.trainable_variables))
    return loss


pairs = tf.data.Dataset.from_tensor_slices((images, digits)).batch(64)
seen = 0
for epoch in range(3):
    losses = []
    for xb, yb in pairs:
        seen += 1
        losses.append(float(fit_batch(xb, yb, tf.constant(1.0 + 1.0 / seen))))
    print(f"epoch {epoch}: loss {np.mean(losses):.4f}")
