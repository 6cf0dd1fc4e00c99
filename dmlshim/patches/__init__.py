"""One module per area; dmlshim.api.PATCH_MODULES lists them in install order."""
