"""The built-in model agent (`kind: model`): a computer-use loop for Anthropic's Messages API, OpenAI's
Responses API and any OpenAI-compatible Chat Completions server, through the providers' own SDKs.

`loop` is the step lifecycle and its outcomes; `actions` the one action set every API maps to; `actor`
carries actions to the machine; `screen` scales what the model sees; `usage` its account; one module
per API (`anthropic_api`, `responses_api`, `chat_api`, with `textformats` for pyautogui and UI-TARS).
Where an SDK ships a computer-use driver interface, the machine is that driver (see each API module for
what is the SDK's and why the loop is ours).
"""
