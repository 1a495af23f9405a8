/* The part of ONNX Runtime's C API (`OrtApi`) that recserve calls, declared here because
 * the onnxruntime wheel ships libonnxruntime.so but no headers.
 *
 * `OrtApi` is a table of function pointers that ONNX Runtime only ever appends to: an entry
 * never moves once a version has shipped, and `OrtApiBase::GetApi(v)` returns a table
 * whose first entries are exactly version v's. This file declares version
 * RS_ORT_API_VERSION (11, ONNX Runtime 1.11, the first with the CUDA V2 provider options),
 * all 210 entries in order: the ones recserve calls with their real signatures (read from
 * include/onnxruntime/core/session/onnxruntime_c_api.h in microsoft/onnxruntime), the rest
 * as opaque `void *` slots. The static asserts at the end pin each named entry to its index
 * and the table's length to version 11's, using the checkpoints ONNX Runtime itself
 * asserts in onnxruntime_c_api.cc ("Size of version N API cannot change");
 * tests/runtime/test_native_runner.py checks the declarations against the installed
 * library by calling them.
 */
#ifndef RECSERVE_ORT_API_H
#define RECSERVE_ORT_API_H

#include <stddef.h>
#include <stdint.h>

#define RS_ORT_API_VERSION 11u

typedef struct OrtStatus OrtStatus;
typedef struct OrtEnv OrtEnv;
typedef struct OrtMemoryInfo OrtMemoryInfo;
typedef struct OrtSession OrtSession;
typedef struct OrtValue OrtValue;
typedef struct OrtRunOptions OrtRunOptions;
typedef struct OrtTypeInfo OrtTypeInfo;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtThreadingOptions OrtThreadingOptions;
typedef struct OrtTensorRTProviderOptionsV2 OrtTensorRTProviderOptionsV2;
typedef struct OrtCUDAProviderOptionsV2 OrtCUDAProviderOptionsV2;
typedef struct OrtPrepackedWeightsContainer OrtPrepackedWeightsContainer;

/* Enumerations as the header numbers them (C enums are int-sized on every ABI ORT ships for). */
typedef enum { RS_ORT_OK = 0, RS_ORT_FAIL = 1, RS_ORT_INVALID_ARGUMENT = 2 } OrtErrorCode;
typedef enum { RS_ORT_LOG_VERBOSE, RS_ORT_LOG_INFO, RS_ORT_LOG_WARNING, RS_ORT_LOG_ERROR, RS_ORT_LOG_FATAL } OrtLoggingLevel;
typedef enum { RS_ORT_SEQUENTIAL = 0, RS_ORT_PARALLEL = 1 } ExecutionMode;
typedef enum { RS_ORT_DISABLE_ALL = 0, RS_ORT_ENABLE_BASIC = 1, RS_ORT_ENABLE_EXTENDED = 2, RS_ORT_ENABLE_ALL = 99 } GraphOptimizationLevel;
typedef enum { RS_ORT_DEVICE_ALLOCATOR = 0, RS_ORT_ARENA_ALLOCATOR = 1 } OrtAllocatorType;
typedef enum { RS_ORT_MEM_TYPE_DEFAULT = 0 } OrtMemType;
typedef enum { RS_ONNX_TYPE_UNKNOWN = 0, RS_ONNX_TYPE_TENSOR = 1 } ONNXType;
typedef int ONNXTensorElementDataType; /* TensorProto.DataType: 1 float, 6 int32, 7 int64, 9 bool, 11 double... */

/* A public struct of the C API (not opaque): ORT's allocators are called through it. */
typedef struct OrtAllocator {
    uint32_t version;
    void *(*Alloc)(struct OrtAllocator *self, size_t size);
    void (*Free)(struct OrtAllocator *self, void *p);
    const OrtMemoryInfo *(*Info)(const struct OrtAllocator *self);
} OrtAllocator;

typedef struct OrtApi OrtApi;

typedef struct OrtApiBase {
    const OrtApi *(*GetApi)(uint32_t version);
    const char *(*GetVersionString)(void);
} OrtApiBase;

typedef const OrtApiBase *(*OrtGetApiBaseFn)(void);

#define RS_ORT_FN(name, ...) OrtStatus *(*name)(__VA_ARGS__)

struct OrtApi {
    void *CreateStatus;                                                                       /* 0 */
    OrtErrorCode (*GetErrorCode)(const OrtStatus *status);                                    /* 1 */
    const char *(*GetErrorMessage)(const OrtStatus *status);                                  /* 2 */
    RS_ORT_FN(CreateEnv, OrtLoggingLevel level, const char *logid, OrtEnv **out);             /* 3 */
    void *slots_4_6[3];  /* CreateEnvWithCustomLogger, Enable/DisableTelemetryEvents */
    RS_ORT_FN(CreateSession, const OrtEnv *env, const char *model_path, const OrtSessionOptions *options,
              OrtSession **out);                                                              /* 7 */
    RS_ORT_FN(CreateSessionFromArray, const OrtEnv *env, const void *model_data, size_t model_data_length,
              const OrtSessionOptions *options, OrtSession **out);                            /* 8 */
    RS_ORT_FN(Run, OrtSession *session, const OrtRunOptions *run_options, const char *const *input_names,
              const OrtValue *const *inputs, size_t input_len, const char *const *output_names,
              size_t output_names_len, OrtValue **outputs);                                   /* 9 */
    RS_ORT_FN(CreateSessionOptions, OrtSessionOptions **options);                             /* 10 */
    void *slots_11_12[2]; /* SetOptimizedModelFilePath, CloneSessionOptions */
    RS_ORT_FN(SetSessionExecutionMode, OrtSessionOptions *options, ExecutionMode mode);       /* 13 */
    void *slots_14_21[8]; /* Enable/DisableProfiling, Enable/DisableMemPattern, Enable/DisableCpuMemArena,
                             SetSessionLogId, SetSessionLogVerbosityLevel */
    RS_ORT_FN(SetSessionLogSeverityLevel, OrtSessionOptions *options, int level);             /* 22 */
    RS_ORT_FN(SetSessionGraphOptimizationLevel, OrtSessionOptions *options, GraphOptimizationLevel level); /* 23 */
    RS_ORT_FN(SetIntraOpNumThreads, OrtSessionOptions *options, int threads);                 /* 24 */
    RS_ORT_FN(SetInterOpNumThreads, OrtSessionOptions *options, int threads);                 /* 25 */
    void *slots_26_29[4]; /* CreateCustomOpDomain, CustomOpDomain_Add, AddCustomOpDomain, RegisterCustomOpsLibrary */
    RS_ORT_FN(SessionGetInputCount, const OrtSession *session, size_t *out);                  /* 30 */
    RS_ORT_FN(SessionGetOutputCount, const OrtSession *session, size_t *out);                 /* 31 */
    void *slot_32;        /* SessionGetOverridableInitializerCount */
    RS_ORT_FN(SessionGetInputTypeInfo, const OrtSession *session, size_t index, OrtTypeInfo **out);  /* 33 */
    RS_ORT_FN(SessionGetOutputTypeInfo, const OrtSession *session, size_t index, OrtTypeInfo **out); /* 34 */
    void *slot_35;        /* SessionGetOverridableInitializerTypeInfo */
    RS_ORT_FN(SessionGetInputName, const OrtSession *session, size_t index, OrtAllocator *allocator,
              char **value);                                                                  /* 36 */
    RS_ORT_FN(SessionGetOutputName, const OrtSession *session, size_t index, OrtAllocator *allocator,
              char **value);                                                                  /* 37 */
    void *slots_38_48[11]; /* SessionGetOverridableInitializerName, CreateRunOptions, 8 RunOptions
                              setters/getters, CreateTensorAsOrtValue */
    RS_ORT_FN(CreateTensorWithDataAsOrtValue, const OrtMemoryInfo *info, void *p_data, size_t p_data_len,
              const int64_t *shape, size_t shape_len, ONNXTensorElementDataType type, OrtValue **out); /* 49 */
    RS_ORT_FN(IsTensor, const OrtValue *value, int *out);                                     /* 50 */
    RS_ORT_FN(GetTensorMutableData, OrtValue *value, void **out);                             /* 51 */
    void *slots_52_54[3]; /* FillStringTensor, GetStringTensorDataLength, GetStringTensorContent */
    RS_ORT_FN(CastTypeInfoToTensorInfo, const OrtTypeInfo *type_info, const OrtTensorTypeAndShapeInfo **out); /* 55 */
    RS_ORT_FN(GetOnnxTypeFromTypeInfo, const OrtTypeInfo *type_info, ONNXType *out);          /* 56 */
    void *slots_57_59[3]; /* CreateTensorTypeAndShapeInfo, SetTensorElementType, SetDimensions */
    RS_ORT_FN(GetTensorElementType, const OrtTensorTypeAndShapeInfo *info, ONNXTensorElementDataType *out); /* 60 */
    RS_ORT_FN(GetDimensionsCount, const OrtTensorTypeAndShapeInfo *info, size_t *out);        /* 61 */
    RS_ORT_FN(GetDimensions, const OrtTensorTypeAndShapeInfo *info, int64_t *dims, size_t dims_len); /* 62 */
    void *slot_63;        /* GetSymbolicDimensions */
    RS_ORT_FN(GetTensorShapeElementCount, const OrtTensorTypeAndShapeInfo *info, size_t *out); /* 64 */
    RS_ORT_FN(GetTensorTypeAndShape, const OrtValue *value, OrtTensorTypeAndShapeInfo **out); /* 65 */
    void *slots_66_68[3]; /* GetTypeInfo, GetValueType, CreateMemoryInfo */
    RS_ORT_FN(CreateCpuMemoryInfo, OrtAllocatorType type, OrtMemType mem_type, OrtMemoryInfo **out); /* 69 */
    void *slot_70;        /* CompareMemoryInfo */
    RS_ORT_FN(MemoryInfoGetName, const OrtMemoryInfo *info, const char **out);                /* 71 */
    void *slots_72_77[6]; /* MemoryInfoGetId/MemType/Type, AllocatorAlloc/Free/GetInfo */
    RS_ORT_FN(GetAllocatorWithDefaultOptions, OrtAllocator **out);                            /* 78 */
    void *slots_79_91[13]; /* AddFreeDimensionOverride, GetValue, GetValueCount, CreateValue,
                              Create/GetOpaqueValue, 3 KernelInfoGetAttribute, 4 KernelContext */
    void (*ReleaseEnv)(OrtEnv *input);                                                        /* 92 */
    void (*ReleaseStatus)(OrtStatus *input);                                                  /* 93 */
    void (*ReleaseMemoryInfo)(OrtMemoryInfo *input);                                          /* 94 */
    void (*ReleaseSession)(OrtSession *input);                                                /* 95 */
    void (*ReleaseValue)(OrtValue *input);                                                    /* 96 */
    void *slot_97;        /* ReleaseRunOptions */
    void (*ReleaseTypeInfo)(OrtTypeInfo *input);                                              /* 98 */
    void (*ReleaseTensorTypeAndShapeInfo)(OrtTensorTypeAndShapeInfo *input);                  /* 99 */
    void (*ReleaseSessionOptions)(OrtSessionOptions *input);                                  /* 100 */
    void *slots_101_118[18]; /* ReleaseCustomOpDomain (end of version 1), type-info casts, map and
                                sequence infos, SessionEndProfiling, model metadata (end of version 2) */
    RS_ORT_FN(CreateEnvWithGlobalThreadPools, OrtLoggingLevel level, const char *logid,
              const OrtThreadingOptions *tp_options, OrtEnv **out);                           /* 119 */
    RS_ORT_FN(DisablePerSessionThreads, OrtSessionOptions *options);                          /* 120 */
    RS_ORT_FN(CreateThreadingOptions, OrtThreadingOptions **out);                             /* 121 */
    void (*ReleaseThreadingOptions)(OrtThreadingOptions *input);                              /* 122 */
    void *slots_123_124[2]; /* ModelMetadataGetCustomMetadataMapKeys, AddFreeDimensionOverrideByName */
    RS_ORT_FN(GetAvailableProviders, char ***out, int *length);                               /* 125 */
    RS_ORT_FN(ReleaseAvailableProviders, char **ptr, int length);                             /* 126 */
    void *slots_127_129[3]; /* GetStringTensorElementLength, GetStringTensorElement, FillStringTensorElement */
    RS_ORT_FN(AddSessionConfigEntry, OrtSessionOptions *options, const char *key, const char *value); /* 130 */
    void *slots_131_146[16]; /* CreateAllocator ... SessionGetProfilingStartTimeNs (IoBinding, TensorAt,
                                CreateAndRegisterAllocator, SetLanguageProjection) */
    RS_ORT_FN(SetGlobalIntraOpNumThreads, OrtThreadingOptions *tp_options, int threads);      /* 147 */
    RS_ORT_FN(SetGlobalInterOpNumThreads, OrtThreadingOptions *tp_options, int threads);      /* 148 */
    RS_ORT_FN(SetGlobalSpinControl, OrtThreadingOptions *tp_options, int allow_spinning);     /* 149 */
    RS_ORT_FN(AddInitializer, OrtSessionOptions *options, const char *name, const OrtValue *val); /* 150 */
    void *slots_151_165[15]; /* CreateEnvWithCustomLoggerAndGlobalThreadPools, the V1 CUDA/ROCM/OpenVINO
                                appends, arena configs, V1 TensorRT, GPU device id, AddRunConfigEntry */
    RS_ORT_FN(CreatePrepackedWeightsContainer, OrtPrepackedWeightsContainer **out);           /* 166 */
    void (*ReleasePrepackedWeightsContainer)(OrtPrepackedWeightsContainer *input);            /* 167 */
    RS_ORT_FN(CreateSessionWithPrepackedWeightsContainer, const OrtEnv *env, const char *model_path,
              const OrtSessionOptions *options, OrtPrepackedWeightsContainer *container,
              OrtSession **out);                                                              /* 168 */
    RS_ORT_FN(CreateSessionFromArrayWithPrepackedWeightsContainer, const OrtEnv *env, const void *model_data,
              size_t model_data_length, const OrtSessionOptions *options,
              OrtPrepackedWeightsContainer *container, OrtSession **out);                     /* 169 */
    RS_ORT_FN(SessionOptionsAppendExecutionProvider_TensorRT_V2, OrtSessionOptions *options,
              const OrtTensorRTProviderOptionsV2 *trt_options);                               /* 170 */
    RS_ORT_FN(CreateTensorRTProviderOptions, OrtTensorRTProviderOptionsV2 **out);             /* 171 */
    RS_ORT_FN(UpdateTensorRTProviderOptions, OrtTensorRTProviderOptionsV2 *trt_options,
              const char *const *keys, const char *const *values, size_t num_keys);           /* 172 */
    void *slot_173;       /* GetTensorRTProviderOptionsAsString */
    void (*ReleaseTensorRTProviderOptions)(OrtTensorRTProviderOptionsV2 *input);              /* 174 */
    void *slots_175_203[29]; /* EnableOrtCustomOps, allocators, sparse tensors (end of version 9),
                                HasValue ... SynchronizeBoundOutputs (end of version 10) */
    RS_ORT_FN(SessionOptionsAppendExecutionProvider_CUDA_V2, OrtSessionOptions *options,
              const OrtCUDAProviderOptionsV2 *cuda_options);                                  /* 204 */
    RS_ORT_FN(CreateCUDAProviderOptions, OrtCUDAProviderOptionsV2 **out);                     /* 205 */
    RS_ORT_FN(UpdateCUDAProviderOptions, OrtCUDAProviderOptionsV2 *cuda_options,
              const char *const *keys, const char *const *values, size_t num_keys);           /* 206 */
    void *slot_207;       /* GetCUDAProviderOptionsAsString */
    void (*ReleaseCUDAProviderOptions)(OrtCUDAProviderOptionsV2 *input);                      /* 208 */
    void *slot_209;       /* SessionOptionsAppendExecutionProvider_MIGraphX: the last entry of version 11 */
};

#undef RS_ORT_FN

#define RS_ORT_SLOT(field) (offsetof(OrtApi, field) / sizeof(void *))
_Static_assert(sizeof(void (*)(void)) == sizeof(void *), "function and data pointers must have one size");
_Static_assert(RS_ORT_SLOT(GetErrorCode) == 1, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(CreateEnv) == 3, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(CreateSession) == 7, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(Run) == 9, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(SetSessionExecutionMode) == 13, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(SetSessionLogSeverityLevel) == 22, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(SetInterOpNumThreads) == 25, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(SessionGetInputCount) == 30, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(SessionGetOutputName) == 37, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(CreateTensorWithDataAsOrtValue) == 49, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(GetTensorMutableData) == 51, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(CastTypeInfoToTensorInfo) == 55, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(GetTensorElementType) == 60, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(GetTensorTypeAndShape) == 65, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(CreateCpuMemoryInfo) == 69, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(GetAllocatorWithDefaultOptions) == 78, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(ReleaseEnv) == 92, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(ReleaseSessionOptions) == 100, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(slots_101_118) == 101, "version 1 ends with ReleaseCustomOpDomain at 101");
_Static_assert(RS_ORT_SLOT(CreateEnvWithGlobalThreadPools) == 119, "version 2 ends with ReleaseModelMetadata at 118");
_Static_assert(RS_ORT_SLOT(slots_123_124) + 1 == 124, "version 3 ends with AddFreeDimensionOverrideByName at 124");
_Static_assert(RS_ORT_SLOT(ReleaseAvailableProviders) == 126, "version 4 ends with ReleaseAvailableProviders at 126");
_Static_assert(RS_ORT_SLOT(AddSessionConfigEntry) == 130, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(SetGlobalSpinControl) == 149, "version 5 ends with SetGlobalSpinControl at 149");
_Static_assert(RS_ORT_SLOT(AddInitializer) == 150, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(CreatePrepackedWeightsContainer) == 166, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(CreateSessionFromArrayWithPrepackedWeightsContainer) == 169, "version 8 ends at 169");
_Static_assert(RS_ORT_SLOT(SessionOptionsAppendExecutionProvider_TensorRT_V2) == 170, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(ReleaseTensorRTProviderOptions) == 174, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(SessionOptionsAppendExecutionProvider_CUDA_V2) == 204, "version 10 ends at 203");
_Static_assert(RS_ORT_SLOT(ReleaseCUDAProviderOptions) == 208, "OrtApi layout");
_Static_assert(RS_ORT_SLOT(slot_209) == 209, "version 11 ends with SessionOptionsAppendExecutionProvider_MIGraphX at 209");
_Static_assert(sizeof(OrtApi) == 210 * sizeof(void *), "version 11 has 210 entries");

#endif
