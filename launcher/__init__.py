"""ddpjob: one job spec for PyTorch DDP training on local machines, Slurm and Kubernetes."""

__version__ = "0.1.0"
