"""spirelib: the library behind spire-workbook (SPIRe, arXiv 2504.06419)."""
