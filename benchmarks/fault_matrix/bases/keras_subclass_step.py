"""Keras subclassed regressor trained by a tf.function step over NumPy mini-batches (a smooth
synthetic surface in prices, inputs and targets standardised); validation MSE and R² printed
every epoch."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(8)


class Regressor(keras.Model):
    def __init__(self, width=64):
        super().__init__()
        self.hidden = keras.layers.Dense(width, activation="relu")
        self.mid = keras.layers.Dense(width // 2, activation="relu")
        self.out = keras.layers.Dense(1)

    def call(self, x, training=False):
        return self.out(self.mid(self.hidden(x)))


rng = np.random.default_rng(8)
features = np.column_stack([rng.uniform(20, 200, 3000), rng.uniform(1, 6, 3000),
                            rng.normal(0, 1, (3000, 4))]).astype("float32")
target = (800 * np.log(features[:, 0]) + 150 * features[:, 1] ** 1.5
          + 90 * np.sin(2 * features[:, 2]) + 40 * features[:, 3] * features[:, 4]
          + rng.normal(0, 30, 3000)).astype("float32")
x_train, x_val = features[:2400], features[2400:]
y_train, y_val = target[:2400].reshape(-1, 1), target[2400:].reshape(-1, 1)
mean, std = x_train.mean(axis=0), x_train.std(axis=0)
x_train, x_val = (x_train - mean) / std, (x_val - mean) / std
y_mean, y_std = y_train.mean(), y_train.std()
y_train, y_val = (y_train - y_mean) / y_std, (y_val - y_mean) / y_std

net = Regressor()
optimizer = keras.optimizers.Adam(learning_rate=2e-3)
mse = keras.losses.MeanSquaredError()


@tf.function
def train_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = mse(yb, net(xb, training=True))
    grads = tape.gradient(loss, net.trainable_variables)
    optimizer.apply_gradients(zip(grads, net.trainable_variables))
    return loss


batch = 32
for epoch in range(8):
    shuffle = np.random.permutation(len(x_train))
    losses = []
    for start in range(0, len(x_train), batch):
        rows = shuffle[start:start + batch]
        losses.append(float(train_step(x_train[rows], y_train[rows])))
    pred = net(x_val, training=False).numpy()
    val_mse = float(np.mean((pred - y_val) ** 2))
    r2 = 1.0 - val_mse / float(np.var(y_val))
    print(f"epoch {epoch:02d} train_mse={np.mean(losses):.4f} val_mse={val_mse:.4f} val_r2={r2:.3f}")
