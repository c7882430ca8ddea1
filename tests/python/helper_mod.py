"""A second module for tests of callees whose globals are not the compiled function's."""

import torch

FACTOR = 2.0
OFFSET = torch.ones(3)


def scaled(x):
    return x * FACTOR + OFFSET


def set_factor(v):
    global FACTOR
    FACTOR = v


def bump_global(x):
    global FACTOR
    FACTOR = FACTOR + 1
    return x
