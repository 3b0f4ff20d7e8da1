"""A binary classifier whose one output unit goes through a separate softmax layer.

Softmax over one unit is exactly 1.0 for every input: the model always answers class 1 and
accuracy sits at that class's share, whatever the loss curve says. The lint sees the Dense(1)
followed by Activation("softmax"); a measurement confirms it (the model's output is one
constant over rows that differ).

expect-category: convergence_to_wrong_solution
expect-root-cause: architecture
expect-check: loss_output_mismatch
expect-line: Activation("softmax")
expect-backward: fit(
"""
import keras
import numpy as np

rng = np.random.default_rng(8)
signal = rng.normal(size=(1500, 10)).astype("float32")
label = (signal[:, :3].sum(axis=1) > 0.4).astype("float32")

net = keras.Sequential([
    keras.Input((10,)),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dense(1),
    keras.layers.Activation("softmax"),
])
net.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
net.fit(signal, label, epochs=5, batch_size=64, validation_split=0.25, verbose=0)
