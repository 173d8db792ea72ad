"""The docker backend (backend): the engine's API (api) and a container's health (health)."""
