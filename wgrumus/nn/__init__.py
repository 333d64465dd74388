"""Neural-network layers, containers, initialisers and functional forms (PyTorch's names)."""
from . import functional, init, utils
from .activation_layers import (CELU, ELU, GLU, SELU, BatchNorm1d, Hardshrink, Hardsigmoid,
                                Hardswish, Hardtanh, LeakyReLU, LogSigmoid, LogSoftmax, Mish,
                                ModuleDict, PReLU, ReLU6, SiLU, Softmax, Softplus, Softshrink,
                                Softsign, Tanhshrink, Threshold)
from .attention import MLP, MultiheadAttention, TransformerBlock, causal_mask
from .gpt import GPT, GPTConfig
from .conv_layers import (AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool1d,
                          AvgPool2d, Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d, Fold,
                          MaxPool1d, MaxPool2d, Unfold, Upsample)
from .layers import (GELU, BatchNorm2d, Dropout, Embedding, Flatten, Identity, LayerNorm, Linear,
                     ModuleList, ReLU, Sequential, Sigmoid, Tanh)
from .losses import CrossEntropyLoss, MSELoss
from .norm_pad_layers import (CircularPad1d, CircularPad2d, ConstantPad1d, ConstantPad2d,
                              GroupNorm, InstanceNorm1d, InstanceNorm2d, ReflectionPad1d,
                              ReflectionPad2d, ReplicationPad1d, ReplicationPad2d, Unflatten,
                              ZeroPad1d, ZeroPad2d)
from .more_losses import (BCELoss, BCEWithLogitsLoss, HuberLoss, KLDivLoss, L1Loss, NLLLoss,
                          SmoothL1Loss)
from .module import Module, Parameter, StateDictError

__all__ = ["functional", "init", "utils", "Module", "Parameter", "StateDictError", "Sequential",
           "ModuleList", "Identity", "Linear", "Embedding", "LayerNorm", "BatchNorm2d", "ReLU",
           "GELU", "Tanh", "Sigmoid", "Dropout", "Flatten", "Conv2d", "MaxPool2d", "AvgPool2d",
           "MultiheadAttention", "MLP", "TransformerBlock", "GPT", "GPTConfig", "causal_mask",
           "CrossEntropyLoss", "MSELoss",
           "CELU", "ELU", "GLU", "Hardshrink", "Hardsigmoid", "Hardswish", "Hardtanh",
           "LeakyReLU", "LogSigmoid", "LogSoftmax", "Mish", "ModuleDict", "PReLU", "ReLU6",
           "SELU", "SiLU", "Softmax", "Softplus", "Softshrink", "Softsign", "Tanhshrink",
           "Threshold", "BatchNorm1d", "BCELoss", "BCEWithLogitsLoss", "HuberLoss", "KLDivLoss",
           "L1Loss", "NLLLoss", "SmoothL1Loss", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d",
           "AdaptiveMaxPool2d", "AvgPool1d", "Conv1d", "ConvTranspose1d", "ConvTranspose2d",
           "Fold", "MaxPool1d", "Unfold", "Upsample", "CircularPad1d", "CircularPad2d",
           "ConstantPad1d", "ConstantPad2d", "GroupNorm", "InstanceNorm1d", "InstanceNorm2d",
           "ReflectionPad1d", "ReflectionPad2d", "ReplicationPad1d", "ReplicationPad2d",
           "Unflatten", "ZeroPad1d", "ZeroPad2d"]
