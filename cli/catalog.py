"""`specpair catalog`: placeholder replaced below."""
