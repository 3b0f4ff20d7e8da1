"""A sigmoid on a regression output: house prices in thousands squeezed into (0, 1).

The targets lie between 80 and 500; the model's last Dense has a sigmoid, so every
prediction presses against 1.0 and the loss settles far above zero. Isolate must read the
trained model's output range, call it a wrong solution of the architecture and point at the
layer that made the output, not at the line that assembled the model.

expect-category: convergence_to_wrong_solution
expect-root-cause: architecture
expect-check: loss_output_mismatch
expect-line: activation="sigmoid"
expect-backward: fit(
"""
import keras
import numpy as np

rng = np.random.default_rng(11)
rooms = rng.uniform(1, 6, size=(900, 1))
area = rng.uniform(40, 220, size=(900, 1))
age = rng.uniform(0, 60, size=(900, 1))
features = np.hstack([rooms, area / 100.0, age / 30.0]).astype("float32")
price = (60 + 35 * rooms[:, 0] + 1.2 * area[:, 0] - 0.8 * age[:, 0]).astype("float32")

features_in = keras.Input(shape=(3,))
hidden = keras.layers.Dense(24, activation="relu")(features_in)
hidden = keras.layers.Dense(12, activation="relu")(hidden)
price_out = keras.layers.Dense(1, activation="sigmoid")(hidden)
regressor = keras.Model(features_in, price_out)

regressor.compile(optimizer=keras.optimizers.Adam(0.005), loss="mse")
history = regressor.fit(features, price, epochs=8, batch_size=32, validation_split=0.2,
                        verbose=0)
print("val mse", history.history["val_loss"][-1])
