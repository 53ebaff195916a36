"""Small helpers every package may use, below all of them and importing none of ours: the one timeout
helper (`timeouts`) and the one config file reader (`configfile`)."""
