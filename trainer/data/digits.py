"""scikit-learn's bundled handwritten digits: 1,797 real 8x8 images, 10 classes, no download.

Source: the UCI "Optical Recognition of Handwritten Digits" test set, as shipped in
``sklearn.datasets.load_digits``.
"""

from __future__ import annotations

import torch

from halfcast.contracts.catalog import DigitsConfig
from trainer.data.arrays import ArrayDataset
from trainer.data.base import DataInfo, Task

#: Pixel intensities in ``load_digits`` are integers in [0, 16].
PIXEL_MAX = 16.0


def build_digits(config: DigitsConfig) -> ArrayDataset:
    """Features float32 ``[N, 64]`` in [0, 1] (pixels / 16), labels int64 ``[N]`` in [0, 10).

    The held-out split is stratified by class: ``test_fraction`` of the images, chosen
    by ``split_seed`` (``sklearn.model_selection.train_test_split``).
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    features, labels = load_digits(return_X_y=True)
    train_x, eval_x, train_y, eval_y = train_test_split(
        features / PIXEL_MAX,
        labels,
        test_size=config.test_fraction,
        random_state=config.split_seed,
        stratify=labels,
    )
    return ArrayDataset(
        info=DataInfo(task=Task.CLASSIFICATION, num_outputs=10, in_features=features.shape[1]),
        train_x=torch.as_tensor(train_x, dtype=torch.float32),
        train_y=torch.as_tensor(train_y, dtype=torch.int64),
        eval_x=torch.as_tensor(eval_x, dtype=torch.float32),
        eval_y=torch.as_tensor(eval_y, dtype=torch.int64),
    )
