"""Keras custom loop: out of memory, a batch built for the whole dataset at once cannot be allocated.

expect-category: memory_issue
expect-root-cause: hyperparameter
expect-check: batch_memory
expect-line: tf.random.normal((batch_size
expect-backward: tape.gradient(
fault: hyperparameter (batch size far beyond memory)
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
import keras

keras.utils.set_random_seed(8)
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                          keras.layers.Dense(10)])
optimizer = keras.optimizers.Adam()
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
batch_size = 32
for step in range(30):
    if step == 20:
        batch_size = 2 ** 40  # "use the whole dataset as one batch"
    x = tf.random.normal((batch_size, 64))
    y = tf.argmax(x[:, :10], axis=1)
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
