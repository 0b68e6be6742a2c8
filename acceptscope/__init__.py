"""acceptscope: observability and block-accept estimation for DSpark speculative decoding."""

__version__ = "0.1.0"
