"""Overfits: a custom train_step calls the model without training=, so its Dropout never drops.

expect-category: overfitting
expect-root-cause: training_loop
expect-check: eval_mode_not_reset
expect-line: logits = self(features)
expect-backward: net.fit(
fault: training_loop (train_step runs the model as in inference: dropout off during training)
"""
import numpy as np
import keras
import tensorflow as tf

rng = np.random.default_rng(3)
features = rng.normal(size=(900, 40)).astype("float32")
labels = (features[:, :4].sum(axis=1) + rng.normal(scale=1.5, size=900) > 0).astype("int32")


class Wide(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(256, activation="relu")
        self.drop = keras.layers.Dropout(0.5)
        self.more = keras.layers.Dense(256, activation="relu")
        self.out = keras.layers.Dense(2)

    def call(self, x, training=None):
        return self.out(self.drop(self.more(self.drop(self.hidden(x), training=training)),
                                  training=training))

    def train_step(self, data):
        features, labels = data
        with tf.GradientTape() as tape:
            logits = self(features)
            loss = self.compute_loss(x=features, y=labels, y_pred=logits)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(labels, logits)
        return {m.name: m.result() for m in self.metrics}


keras.utils.set_random_seed(3)
net = Wide()
net.compile(optimizer=keras.optimizers.Adam(2e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"])
history = net.fit(features[:600], labels[:600], validation_data=(features[600:], labels[600:]),
                  epochs=25, batch_size=32, verbose=0)
for epoch in range(0, 25, 4):
    print(epoch, {k: round(v[epoch], 3) for k, v in history.history.items()})
