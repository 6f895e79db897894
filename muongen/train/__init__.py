"""Training: the GAN step, the Trainer, checkpoints, distributed helpers.

Kept import-light on purpose (no torch here): ``muongen --help`` and the verbs that do
not train import this package without paying for torch. Import the submodules directly,
e.g. ``from muongen.train.step import GanStep``.
"""
