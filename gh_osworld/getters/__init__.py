"""OSWorld getters: where the state is read, in the guest (registry.getter)."""
