# Generated at build time next to cairn._cairn_torch: the torch it was built for.
TORCH_VERSION: str
TORCH_INIT: str
