"""Small helpers every package may use, below all of them and importing none of ours: the one timeout
helper (`timeouts`), the one capped backoff (`backoff`), the one config file reader (`configfile`) and
the PNG writer screenshots are encoded with (`png`)."""
