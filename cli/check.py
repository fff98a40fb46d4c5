"""`specpair check TARGET [DRAFT]`: placeholder replaced below."""
