"""The runner <-> server contract, below both halves and importing neither: the protocol's messages
(`protocol`), the input events they carry (`input`), the closed vocabularies both sides and the
database use (`vocab`), and the screenshot masking both sides apply (`masking`)."""
