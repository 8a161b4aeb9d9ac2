"""KV-cache formats beyond a plain torch dtype: `format.py` names them (what
`--kvcache-dtype` parses to and how many bytes a token takes), `turbo*.py` is TurboQuant
(rotated, Lloyd–Max-quantized K/V with one scale per token and head)."""
