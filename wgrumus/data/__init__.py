"""Data: Dataset/TensorDataset, a prefetching DataLoader, DistributedSampler, and small datasets
that ship with the package (8x8 handwritten digits, a Shakespeare character corpus)."""
from .dataset import Dataset, TensorDataset
from .datasets import CharCorpus, digits_dataset, load_digits, load_text
from .loader import DataLoader, DataLoaderError, default_collate
from .sampler import DistributedSampler

__all__ = ["Dataset", "TensorDataset", "DataLoader", "DataLoaderError", "default_collate",
           "DistributedSampler", "load_digits", "digits_dataset", "load_text", "CharCorpus"]
