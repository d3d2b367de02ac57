"""FX passes on the joint graph and on the extracted forward and backward graphs."""
