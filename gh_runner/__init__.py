"""gh-runner: a self-hosted runner daemon that gives every eval attempt a fresh machine."""

__version__ = "0.1.0"
