"""`specpair convert`: the converter (`converter`), its conversion policy (`policy`), the quantization configs it
writes (`quant_configs`) and the demo pair it builds (`demo`), all on the model layer (sources/model.py)."""
