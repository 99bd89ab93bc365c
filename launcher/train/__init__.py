"""The DDP training program that runs inside the image: ``python -m launcher.train --help``.

This package is the only part of ddpjob that imports torch.
"""
