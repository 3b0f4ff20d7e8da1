"""Binary classifier trained with tf.GradientTape over a tf.data pipeline (functional Keras
model with a logit output)."""
import os

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"

import numpy as np
import tensorflow as tf

np.random.seed(4)
tf.random.set_seed(4)

points = np.random.uniform(-1, 1, size=(2000, 2)).astype(np.float32)
inside = (np.sum(points ** 2, axis=1) < 0.5).astype(np.float32).reshape(-1, 1)
train_ds = (tf.data.Dataset.from_tensor_slices((points[:1600], inside[:1600]))
            .shuffle(1600).batch(64))
val_ds = tf.data.Dataset.from_tensor_slices((points[1600:], inside[1600:])).batch(400)

inputs = tf.keras.Input(shape=(2,))
hidden = tf.keras.layers.Dense(32, activation="relu")(inputs)
hidden = tf.keras.layers.Dense(32, activation="relu")(hidden)
logits = tf.keras.layers.Dense(1)(hidden)
model = tf.keras.Model(inputs, logits)

loss_object = tf.keras.losses.BinaryCrossentropy(from_logits=True)
optimizer = tf.keras.optimizers.Adam(0.01)
val_acc = tf.keras.metrics.BinaryAccuracy(threshold=0.0)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = loss_object(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


for epoch in range(10):
    for x_batch, y_batch in train_ds:
        loss = train_step(x_batch, y_batch)
    val_acc.reset_state()
    for x_batch, y_batch in val_ds:
        val_acc.update_state(y_batch, model(x_batch, training=False))
    print(f"Epoch {epoch + 1}: loss={float(loss):.4f} val_acc={float(val_acc.result()):.4f}")
