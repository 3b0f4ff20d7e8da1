"""Keras custom loop over a tf.data pipeline batched to the whole training set: 12 epochs are
12 optimizer updates, and the loss is still near the label prior's when the run ends.

expect-category: loss_not_decreasing
expect-root-cause: hyperparameter
expect-check: training_length
expect-line: train_data = (
expect-backward: value = train_on(
fault: hyperparameter (batch(2048): one update per epoch)
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

tf.random.set_seed(3)
gen = np.random.default_rng(3)
xs = gen.normal(size=(2560, 6)).astype("float32")
ys = ((xs[:, 0] * xs[:, 1] + xs[:, 2]) > 0).astype("float32")[:, None]
train_data = (tf.data.Dataset.from_tensor_slices((xs[:2048], ys[:2048]))
              .shuffle(2048, seed=3).batch(2048))
held_x, held_y = xs[2048:], ys[2048:]

model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(32, activation="relu"),
                             tf.keras.layers.Dense(32, activation="relu"),
                             tf.keras.layers.Dense(1)])
bce = tf.keras.losses.BinaryCrossentropy(from_logits=True)
sgd = tf.keras.optimizers.Adam(learning_rate=0.01)


@tf.function
def train_on(batch_x, batch_y):
    with tf.GradientTape() as tape:
        value = bce(batch_y, model(batch_x, training=True))
    tape_grads = tape.gradient(value, model.trainable_variables)
    sgd.apply_gradients(zip(tape_grads, model.trainable_variables))
    return value


for epoch in range(12):
    for batch_x, batch_y in train_data:
        value = train_on(batch_x, batch_y)
    held = float(bce(held_y, model(held_x, training=False)))
    print(f"epoch {epoch}: train {float(value):.4f} held-out {held:.4f}")
