"""Agent kind `osworld`: an agent written to OSWorld's loop, run here as it is (docs/agents.md).

`agent.py` is gh-server's side (a command agent whose command is the loop, in the command agents'
sandbox); `loop.py` is the process apart that imports the user's `module:factory` and plays OSWorld's
loop against the machine API; `computer13.py` turns OSWorld's computer_13 actions into our input events.
`loop.py` and `computer13.py` import only the standard library: they run beside the user's code.
"""
