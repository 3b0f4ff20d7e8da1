"""Loss spikes: house prices sorted by price, and `fit` told not to shuffle.

expect-category: gradient_instability
expect-root-cause: data
expect-check: data_order
expect-line: model.fit(
expect-backward: .fit(
fault: data (rows sorted by the target, fit(shuffle=False))
"""
import numpy as np
import keras

rng = np.random.default_rng(3)
size = rng.uniform(40, 200, 3000)
rooms = rng.integers(1, 6, 3000)
age = rng.uniform(0, 60, 3000)
price = 0.02 * size + 0.3 * rooms - 0.01 * age + rng.normal(scale=0.2, size=3000)
table = np.stack([size / 100, rooms / 3, age / 30, price], axis=1).astype("float32")
table = table[np.argsort(table[:, -1])]               # the export came sorted by price
x, y = table[:, :3], table[:, 3:]
y = (y - y.mean()) / y.std()

model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
model.fit(x, y, batch_size=50, epochs=4, shuffle=False, verbose=2)
