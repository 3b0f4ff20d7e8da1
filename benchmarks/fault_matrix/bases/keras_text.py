"""Support-ticket triage: TextVectorization ids, masked embedding, GRU, Keras fit."""
import keras
import numpy as np
from keras import layers

URGENT = ["outage", "down", "crash", "breach", "refund", "locked"]
ROUTINE = ["invoice", "question", "feature", "thanks", "update", "schedule"]
FILLER = [f"w{i}" for i in range(40)]


def make_tickets(n, rng):
    texts, labels = [], []
    for _ in range(n):
        urgent = int(rng.random() < 0.5)
        words = list(rng.choice(FILLER, size=int(rng.integers(4, 40))))
        cue = URGENT if urgent else ROUTINE
        for pos in rng.choice(len(words), size=2, replace=False):
            words[pos] = str(rng.choice(cue))
        texts.append(" ".join(words))
        labels.append(urgent)
    return np.array(texts), np.array(labels, dtype="float32")


rng = np.random.default_rng(8)
keras.utils.set_random_seed(8)
train_texts, train_labels = make_tickets(1500, rng)
val_texts, val_labels = make_tickets(400, rng)

vectorize = layers.TextVectorization(max_tokens=80, output_sequence_length=120)
vectorize.adapt(train_texts)
train_ids = vectorize(train_texts).numpy()
val_ids = vectorize(val_texts).numpy()

inputs = keras.Input(shape=(120,), dtype="int64")
h = layers.Embedding(80, 16, mask_zero=True)(inputs)
h = layers.GRU(24)(h)
outputs = layers.Dense(1, activation="sigmoid")(h)
model = keras.Model(inputs, outputs)
model.compile(optimizer=keras.optimizers.Adam(5e-3), loss="binary_crossentropy",
              metrics=["accuracy"])
history = model.fit(train_ids, train_labels, validation_data=(val_ids, val_labels),
                    batch_size=50, epochs=4, verbose=0)
print("val_loss", round(history.history["val_loss"][-1], 4))
print("val_accuracy", round(history.history["val_accuracy"][-1], 4))
