from libreyolo_cpp import LibreYOLO

if __name__ == "__main__":
    model = LibreYOLO("LibreYOLO9s.pt")
    # Probed once on GPU 0, then scaled to a multiple of the world size.
    model.train(data="my-dataset.yaml", batch=-1, device="0,1")
