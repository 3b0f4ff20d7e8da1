"""Healthy signals, latent pitfall: a softmax output compiled with ``from_logits=True``.

Keras on TensorFlow takes the logits from the softmax's input inside the compiled step and
warns, so this run trains; an eager loop or another backend would apply softmax twice. The
category stays healthy and the pitfall is reported as an unconfirmed hypothesis at the layer.

expect-category: healthy
expect-hypothesis: lint|framework_warnings
expect-line: activation="softmax"
expect-backward: fit(
"""
import keras
import numpy as np

rng = np.random.default_rng(3)
centres = rng.normal(0, 3, size=(4, 8))
labels = rng.integers(0, 4, size=1600)
features = (centres[labels] + rng.normal(size=(1600, 8))).astype("float32")

net = keras.Sequential([
    keras.Input((8,)),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dense(4, activation="softmax"),
])
net.compile(optimizer=keras.optimizers.Adam(3e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"])
net.fit(features[:1200], labels[:1200], validation_data=(features[1200:], labels[1200:]),
        epochs=6, batch_size=32, verbose=0)
