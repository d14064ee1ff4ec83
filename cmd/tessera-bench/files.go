package main

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// outFile is one file a report writes: its name in the output folder and
// its content.
type outFile struct {
	name string
	data []byte
}

// jsonFile is v as indented JSON that ends in a newline.
func jsonFile(name string, v any) (outFile, error) {
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return outFile{}, err
	}
	return outFile{name, append(js, '\n')}, nil
}

// writeFiles creates out and writes files into it, in order.
func writeFiles(out string, files ...outFile) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(out, f.name), f.data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// writeMarkdownJSON writes out/base.md (md) and out/base.json (v) and
// returns the path of the first.
func writeMarkdownJSON(out, base, md string, v any) (string, error) {
	js, err := jsonFile(base+".json", v)
	if err != nil {
		return "", err
	}
	if err := writeFiles(out, outFile{base + ".md", []byte(md)}, js); err != nil {
		return "", err
	}
	return filepath.Join(out, base+".md"), nil
}
