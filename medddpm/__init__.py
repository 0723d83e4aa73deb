"""medddpm: an executable, reproducible artifact of the ICPE '26 Med-DDPM GPU performance study."""

__version__ = "0.1.0"
