package envd

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/deerflow-sandbox/provisioner/pkg/envd/filesystem"
)

// writtenFile is one entry of an upload's answer, as the SDK's write()
// reads it.
type writtenFile struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// download answers GET /files?path=P: the file's bytes, with ranges and
// conditional requests as net/http serves them. The username parameter is
// ignored (the agent runs as one user). The SDK's gzip option only asks
// (Accept-Encoding); the file is sent as is, which every client accepts.
func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	path, err := filesystem.Resolve(r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "the path query parameter is missing or empty")
		return
	}
	f, err := os.Open(path)
	if err != nil {
		writeError(w, filesystem.HTTPStatus(err), fmt.Sprintf("opening %q: %v", path, errors.Unwrap(err)))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeError(w, filesystem.HTTPStatus(err), fmt.Sprintf("stat %q: %v", path, err))
		return
	}
	if fi.IsDir() {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%q is a directory, not a file", path))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", "attachment; filename*=UTF-8''"+url.PathEscape(fi.Name()))
	http.ServeContent(w, r, "", fi.ModTime(), f)
}

// upload answers POST /files: multipart/form-data with one or more parts
// named "file" (each written to ?path= if given, else to its filename,
// which the SDK sets to the destination path), or any other body
// (application/octet-stream, optionally Content-Encoding: gzip) written to
// ?path=. Bodies stream to disk; parent directories are made; an existing
// file is overwritten. The answer is [{name, type, path}] per file.
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	query := r.URL.Query().Get("path")
	// The request's X-Metadata-* pairs become every file's metadata, in
	// place of what it had (none sent: none kept); checked before anything
	// is written.
	meta, err := filesystem.MetadataFrom(r.Header)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	mediaType, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var written []writtenFile
	if mediaType == "multipart/form-data" {
		mr, err := r.MultipartReader()
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("reading the multipart body: %v", err))
			return
		}
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				writeError(w, http.StatusBadRequest, fmt.Sprintf("reading the multipart body: %v", err))
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			dest := query
			if dest == "" {
				dest = rawFileName(part)
			}
			wf, status, err := s.writeFile(dest, part, meta)
			part.Close()
			if err != nil {
				writeError(w, status, err.Error())
				return
			}
			written = append(written, wf)
		}
		if len(written) == 0 {
			writeError(w, http.StatusBadRequest, `the multipart body has no part named "file"`)
			return
		}
	} else {
		if query == "" {
			writeError(w, http.StatusBadRequest, "an upload that is not multipart needs the path query parameter")
			return
		}
		body := io.Reader(r.Body)
		switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
		case "", "identity":
		case "gzip":
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				writeError(w, http.StatusBadRequest, fmt.Sprintf("reading the gzip body: %v", err))
				return
			}
			defer zr.Close()
			body = zr
		default:
			writeError(w, http.StatusBadRequest, fmt.Sprintf("Content-Encoding %q: only gzip is understood", enc))
			return
		}
		wf, status, err := s.writeFile(query, body, meta)
		if err != nil {
			writeError(w, status, err.Error())
			return
		}
		written = append(written, wf)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(written)
}

// rawFileName is a part's filename as sent. multipart.Part.FileName keeps
// only its last element, but the SDK sends the whole destination path.
func rawFileName(p *multipart.Part) string {
	_, params, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}

// writeFile streams body into dest, making its parent directories, and
// gives it the metadata meta. On failure it answers the HTTP status the SDK
// maps (400, 404, 507...); metadata the filesystem cannot keep is a 400
// after the file was written.
func (s *Server) writeFile(dest string, body io.Reader, meta map[string]string) (writtenFile, int, error) {
	path, err := filesystem.Resolve(dest)
	if err != nil {
		return writtenFile{}, http.StatusBadRequest, errors.New("a file to upload has no destination path (the path query parameter or the part's filename)")
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return writtenFile{}, http.StatusBadRequest, fmt.Errorf("%q is a directory; upload to a file path", path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return writtenFile{}, filesystem.HTTPStatus(err), fmt.Errorf("making the parent directories of %q: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o666)
	if err != nil {
		return writtenFile{}, filesystem.HTTPStatus(err), fmt.Errorf("opening %q for writing: %w", path, err)
	}
	src := &readErrors{r: body}
	_, err = io.Copy(f, src)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		s.log.Warn("an upload failed", "path", path, "err", err)
		if src.err != nil {
			// Not the disk's fault: the body broke off or was malformed.
			return writtenFile{}, http.StatusBadRequest, fmt.Errorf("reading the upload for %q: %w", path, src.err)
		}
		return writtenFile{}, filesystem.HTTPStatus(err), fmt.Errorf("writing %q: %w", path, err)
	}
	if err := filesystem.SetMetadata(path, meta); err != nil {
		return writtenFile{}, filesystem.HTTPStatus(err), err
	}
	wf := writtenFile{Name: filepath.Base(path), Type: "file", Path: path}
	if len(meta) > 0 {
		wf.Metadata = meta
	}
	return wf, 0, nil
}

// readErrors remembers its reader's error other than EOF, so a failed copy
// tells the client's fault (the body) from the disk's.
type readErrors struct {
	r   io.Reader
	err error
}

func (e *readErrors) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		e.err = err
	}
	return n, err
}
