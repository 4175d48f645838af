"""oom-triage: is a CUDA out-of-memory crash the platform's or the training code's?"""

__version__ = "0.1.0"
