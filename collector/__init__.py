"""In-pod collector (standard library + torch only). See collector/README in the docs."""
