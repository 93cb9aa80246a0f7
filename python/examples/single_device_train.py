from libreyolo_cpp import LibreYOLO

if __name__ == "__main__":
    model = LibreYOLO("LibreYOLO9s.pt")
    model.train(data="my-dataset.yaml", epochs=100, batch=32)
