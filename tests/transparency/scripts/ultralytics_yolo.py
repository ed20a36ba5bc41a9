"""Ultralytics: ``YOLO("yolov8n-cls.yaml").train(...)``, a classifier built from its model config (no
weights downloaded), on a tiny synthetic image dataset written to disk in Ultralytics' layout
(``train/<class>/``, ``val/<class>/``). Ultralytics' trainer builds its own optimizer, EMA and data
loader, validates after the last epoch and saves its own checkpoints (``weights/last.pt`` and
``best.pt``: whole modules, pickled), loaded back with ``YOLO(path)``. Losses are read from the
trainer's ``on_train_batch_end`` callback; the door attaches a ``leafwatch.Monitor`` from the
``on_train_start`` callback, where the trainer's model and optimizer exist.

The classification task, not detection: detection's validation calls torchvision's compiled NMS,
which the CUDA build of torchvision 0.28.0 cannot run beside a CPU torch (``cpu_torchvision.py``);
classification's training and validation use torchvision's pure-Python parts only.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
from _transparency import arguments, attach_monitor, close_monitor, print_loss
from ultralytics import YOLO

IMAGES, SIZE = 8, 32


def write_dataset(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for label, colour in enumerate(((0, 0, 255), (0, 255, 0))):
            folder = root / split / f"class{label}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(IMAGES // 2):
                image = rng.integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8)
                x0, y0 = rng.integers(0, SIZE // 2, 2)
                image[y0:y0 + SIZE // 2, x0:x0 + SIZE // 2] = colour
                cv2.imwrite(str(folder / f"{i}.png"), image)
    return root


def load(out: Path) -> dict:
    return YOLO(str(out / "train" / "weights" / "last.pt")).model.state_dict()


if __name__ == "__main__":
    out, args = arguments(load)
    data = write_dataset(out / "dataset")
    model = YOLO("yolov8n-cls.yaml")
    steps = []
    monitors = []

    def on_train_start(trainer) -> None:
        monitors.append(attach_monitor(trainer.model, trainer.optimizer, out))

    def on_train_batch_end(trainer) -> None:
        steps.append(None)
        print_loss(len(steps), trainer.loss)

    def on_train_end(trainer) -> None:
        close_monitor(monitors.pop())

    model.add_callback("on_train_start", on_train_start)
    model.add_callback("on_train_batch_end", on_train_batch_end)
    model.add_callback("on_train_end", on_train_end)
    model.train(data=str(data), epochs=2, imgsz=SIZE, batch=4, workers=0, device="cpu", seed=0, deterministic=True,
                amp=False, plots=False, nbs=4, project=str(out), name="train", exist_ok=True, verbose=False,
                warmup_epochs=0)
