"""The dataset, in its own file as most projects keep it: synthetic images made from the index."""

import torch
from torch.utils.data import Dataset

IMAGE_SIZE = 8
NUM_CLASSES = 4


class ShapesDataset(Dataset):
    """Each sample is a noisy image whose brightness pattern gives its class; made on the fly."""

    def __init__(self, length=64, seed=0):
        self.length = length
        self.seed = seed

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        g = torch.Generator().manual_seed(self.seed * 100_003 + index)
        label = index % NUM_CLASSES
        image = torch.randn(1, IMAGE_SIZE, IMAGE_SIZE, generator=g) * 0.1
        image[:, label * 2 : label * 2 + 2, :] += 1.0
        version = 1.0  # which code made this sample: the step reports it
        return image, label, version
