"""gh-server: the self-hosted control plane (the /v1 Evals API, the runner gateway, the scheduler)."""
