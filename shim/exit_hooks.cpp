// placeholder: exit and signal hooks (observability work)
