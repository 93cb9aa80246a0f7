from libreyolo_cpp import LibreYOLO

if __name__ == "__main__":
    model = LibreYOLO("LibreRTDETRr18.pt")
    model.train(
        data="my-dataset.yaml",
        batch=32,
        device="0,1",
        sync_bn=True,
    )
