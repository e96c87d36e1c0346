"""The Streamlit research chat (`rubricem ui`): pages draw plain view models; no research logic here."""
